use clap::Parser;

fn main() {
    let opts = blis_calibrate::Opts::parse();
    let code = match blis_calibrate::run(opts, &mut std::io::stdout().lock()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            blis_calibrate::exit_code::ERROR
        }
    };
    std::process::exit(code);
}
