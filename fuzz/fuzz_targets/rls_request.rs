//! libFuzzer driver of `tollgate_fuzz_targets::rls_request`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz_targets::rls_request(data));
