//! Reading a user's text file: UTF-8, with or without a byte-order mark.
//!
//! Editors on Windows (Notepad, PowerShell 5's `Out-File -Encoding utf8`)
//! start UTF-8 files with U+FEFF. YAML and CSV readers skip it, JSON's
//! does not (`expected value at line 1 column 1`), so every file a user
//! hands the tools is read through [`read_text`].

use std::path::Path;

/// The byte-order mark, as a `char`.
const BOM: char = '\u{feff}';

/// The largest text input read, bytes (1 GiB): the largest trace or spec
/// file a user hands the tools is a few hundred MB; an endless stream
/// (`/dev/zero` as a distribution's `file:`) grew the process by 11 GB
/// in 20 s before.
pub const MAX_TEXT_BYTES: u64 = 1 << 30;

/// The content of `path` as UTF-8 text, without a leading byte-order mark.
///
/// # Errors
/// The file cannot be read, is larger than [`MAX_TEXT_BYTES`], or is not
/// UTF-8.
pub fn read_text(path: &Path) -> std::io::Result<String> {
    read_text_limited(path, MAX_TEXT_BYTES)
}

/// [`read_text`] with a limit of `max` bytes.
///
/// # Errors
/// As [`read_text`], with `max` for the limit.
pub fn read_text_limited(path: &Path, max: u64) -> std::io::Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path)?;
    // Sized from the file's length where it has one (a regular file), so
    // that the buffer need not grow as it is read; a pipe or a file still
    // growing reads on from there.
    let hint = file.metadata().map_or(0, |m| m.len()).min(max);
    let mut bytes = Vec::with_capacity(usize::try_from(hint).unwrap_or(0).saturating_add(1));
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("more than {} MiB: not a file this tool reads", max >> 20),
        ));
    }
    let mut text = String::from_utf8(bytes).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })?;
    if text.starts_with(BOM) {
        text.drain(..BOM.len_utf8());
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leading_byte_order_mark_is_dropped_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.json");
        std::fs::write(&p, "\u{feff}{\"a\": \"\u{feff}\"}\n").unwrap();
        assert_eq!(read_text(&p).unwrap(), "{\"a\": \"\u{feff}\"}\n");
        std::fs::write(&p, "{}").unwrap();
        assert_eq!(read_text(&p).unwrap(), "{}");
        std::fs::write(&p, [0xff, 0xfe, b'{']).unwrap();
        assert!(read_text(&p).is_err(), "UTF-16 is not UTF-8");
    }

    #[test]
    fn an_endless_stream_is_read_up_to_the_limit() {
        let e = read_text_limited(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert_eq!(e.to_string(), "more than 1 MiB: not a file this tool reads");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.json");
        std::fs::write(&p, vec![b' '; 1 << 20]).unwrap();
        assert_eq!(read_text_limited(&p, 1 << 20).unwrap().len(), 1 << 20);
    }
}
