//! The `pdp-injector` binary: everything is in the library; [`pdp_injector::cli`] parses the command line and
//! wires the subcommand.

fn main() -> std::process::ExitCode {
    pdp_injector::cli::main()
}
