use blis_traces::command::CommandError;
use blis_traces::exit_code;
use blis_traces::stdio::PipeSafe;
use clap::Parser;

fn main() {
    let opts = blis_loop::Opts::try_parse().unwrap_or_else(|e| {
        if e.use_stderr() {
            exit_code::usage_error(&e.render().to_string(), e.exit_code())
        }
        e.exit()
    });
    let mut out = PipeSafe::new(std::io::stdout().lock());
    exit_code::finish(blis_loop::run(opts, &mut out), CommandError::exit_code);
}
