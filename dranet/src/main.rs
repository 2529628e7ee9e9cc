//! The `dranet` binary: see `dranet --help`.
fn main() -> std::process::ExitCode {
    dranet::cli::main()
}
