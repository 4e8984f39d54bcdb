//! The `tensorzip` binary: the command line of [`tensorzip_cli::run`].

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(tensorzip_cli::run(std::env::args_os()))
}
