//! The `windfall` binary: parses arguments and hands over to `windfall::cli`.

fn main() -> std::process::ExitCode {
    windfall::cli::main()
}
