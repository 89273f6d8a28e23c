use blis_traces::command::CommandError;
use blis_traces::exit_code;
use blis_traces::stdio::PipeSafe;
use clap::Parser;

fn main() {
    let opts = blis_calibrate::Opts::parse();
    let mut out = PipeSafe::new(std::io::stdout().lock());
    exit_code::finish(blis_calibrate::run(opts, &mut out), CommandError::exit_code);
}
