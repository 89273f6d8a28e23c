use clap::Parser;

fn main() {
    let opts = blis_loadgen::Opts::parse();
    let code = match blis_loadgen::run(opts, &mut std::io::stdout().lock()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            blis_loadgen::exit_code::ERROR
        }
    };
    std::process::exit(code);
}
