use clap::Parser;

/// blis-mockserver: not implemented yet.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Opts {}

fn main() {
    let _ = Opts::parse();
}
