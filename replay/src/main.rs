use blis_traces::exit_code;
use blis_traces::stdio::PipeSafe;
use clap::Parser;

fn main() {
    let opts = blis_replay::Opts::parse();
    let mut out = PipeSafe::new(std::io::stdout().lock());
    let result = blis_replay::commands::execute(opts, &mut out).map(|()| exit_code::OK);
    exit_code::finish(result, |_| exit_code::ERROR);
}
