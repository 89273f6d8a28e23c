//! `docs/architectures.md` shows how every bundled `config.json` is read:
//! its table is the one the code produces (each row tested against the
//! Hugging Face meaning of the fields in `latency::hf_config`).

use std::path::Path;

#[test]
fn the_architecture_table_in_the_docs_is_the_one_the_code_reads() {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/architectures.md");
    let text = std::fs::read_to_string(&doc).unwrap_or_default();
    let table = blis_replay::latency::hf_config::bundled_table();
    assert!(
        text.contains(&table),
        "{} does not hold the table the code reads; it is:\n{table}",
        doc.display()
    );
}
