//! Reading a user's text file: UTF-8, with or without a byte-order mark.
//!
//! Editors on Windows (Notepad, PowerShell 5's `Out-File -Encoding utf8`)
//! start UTF-8 files with U+FEFF. YAML and CSV readers skip it, JSON's
//! does not (`expected value at line 1 column 1`), so every file a user
//! hands the tools is read through [`read_text`].

use std::path::Path;

/// The byte-order mark, as a `char`.
const BOM: char = '\u{feff}';

/// The content of `path` as UTF-8 text, without a leading byte-order mark.
///
/// # Errors
/// The file cannot be read, or it is not UTF-8.
pub fn read_text(path: &Path) -> std::io::Result<String> {
    let mut text = std::fs::read_to_string(path)?;
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
}
