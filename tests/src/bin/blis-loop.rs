use clap::Parser;

fn main() {
    let o = blis_tests::LoopOpts::parse();
    match blis_tests::run_loop(&o, &mut |l| eprintln!("{}", l.trim_end())) {
        Ok(r) => {
            print!("{}", r.markdown);
            println!(
                "\nHTML report: {}",
                r.report.with_extension("html").display()
            );
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    }
}
