use clap::Parser;

fn main() {
    let opts = blis_replay::Opts::parse();
    let code = match blis_replay::run::run(opts, &mut std::io::stdout().lock()) {
        Ok(()) => blis_replay::exit_code::OK,
        Err(e) => {
            eprintln!("error: {e:#}");
            blis_replay::exit_code::ERROR
        }
    };
    std::process::exit(code);
}
