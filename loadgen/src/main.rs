use clap::Parser;

fn main() {
    let opts = blis_loadgen::Opts::parse();
    let code = match blis_loadgen::run(
        opts,
        &mut blis_traces::stdio::PipeSafe::new(std::io::stdout().lock()),
    ) {
        Ok(code) => code,
        Err(e) => {
            blis_traces::diag!("error: {:#}", anyhow::Error::from(e));
            blis_loadgen::exit_code::ERROR
        }
    };
    std::process::exit(code);
}
