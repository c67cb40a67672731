//! libFuzzer driver of `tollgate_fuzz_targets::descriptor_key`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz_targets::descriptor_key(data));
