fn main() {
    std::process::exit(cflow::cli::main());
}
