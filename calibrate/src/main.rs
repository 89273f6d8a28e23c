use clap::Parser;

/// blis-calibrate: not implemented yet.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Opts {}

fn main() {
    let _ = Opts::parse();
}
