use clap::Parser;

fn main() {
    let opts = blis_replay::Opts::parse();
    let code = match blis_replay::commands::execute(
        opts,
        &mut blis_traces::stdio::PipeSafe::new(std::io::stdout().lock()),
    ) {
        Ok(()) => blis_replay::exit_code::OK,
        Err(e) => {
            blis_traces::diag!("error: {:#}", anyhow::Error::from(e));
            blis_replay::exit_code::ERROR
        }
    };
    std::process::exit(code);
}
