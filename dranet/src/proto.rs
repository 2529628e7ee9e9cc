//! Generated protobuf code (see `build.rs`; compiled with protox, no `protoc`).
