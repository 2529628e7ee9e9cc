//! Opaque claim config: JSON parsing + upstream's validation on arbitrary bytes.
#![no_main]

use dranet::config::{ConfigError, parse_and_validate};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    match parse_and_validate(data) {
        Ok(_) | Err(ConfigError::Json { .. }) => {}
        // Every decoding or rule failure is reported, bounded, each on its own.
        Err(e) => {
            let n = e.field_errors().len();
            assert!((1..=32).contains(&n) || matches!(e, ConfigError::Invalid { .. }), "{e}");
        }
    }
});
