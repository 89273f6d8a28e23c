use clap::Parser;

fn main() {
    let opts = blis_calibrate::Opts::parse();
    let code = match blis_calibrate::run(
        opts,
        &mut blis_traces::stdio::PipeSafe::new(std::io::stdout().lock()),
    ) {
        Ok(code) => code,
        Err(e) => {
            blis_traces::diag!("error: {:#}", anyhow::Error::from(e));
            blis_calibrate::exit_code::ERROR
        }
    };
    std::process::exit(code);
}
