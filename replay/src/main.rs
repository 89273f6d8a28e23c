use clap::Parser;

/// blis-replay: not implemented yet.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Opts {}

fn main() {
    let _ = Opts::parse();
}
