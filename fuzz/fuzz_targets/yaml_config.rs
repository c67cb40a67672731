//! libFuzzer driver of `tollgate_fuzz_targets::yaml_config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tollgate_fuzz_targets::yaml_config(data));
