use std::io::Write;

use blis_traces::exit_code;
use blis_traces::stdio::PipeSafe;
use clap::Parser;

fn main() {
    let o = blis_loop::LoopOpts::parse();
    let result =
        blis_loop::run_loop(&o, &mut |l| blis_traces::diag!("{}", l.trim_end())).map(|r| {
            let mut out = PipeSafe::new(std::io::stdout().lock());
            let _ = write!(out, "{}", r.markdown);
            let _ = writeln!(
                out,
                "\nHTML report: {}",
                r.report.with_extension("html").display()
            );
            exit_code::OK
        });
    exit_code::finish(result, |e| match e {
        blis_loop::LoopError::Interrupted(_) => exit_code::INTERRUPTED,
        _ => exit_code::ERROR,
    });
}
