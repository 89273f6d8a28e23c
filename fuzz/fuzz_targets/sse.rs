#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| blis_tests::fuzz::run("sse", data));
