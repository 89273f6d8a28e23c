use std::io::Write;

use clap::Parser;

fn main() {
    let o = blis_loop::LoopOpts::parse();
    match blis_loop::run_loop(&o, &mut |l| blis_traces::diag!("{}", l.trim_end())) {
        Ok(r) => {
            let mut out = blis_traces::stdio::PipeSafe::new(std::io::stdout().lock());
            let _ = write!(out, "{}", r.markdown);
            let _ = writeln!(
                out,
                "\nHTML report: {}",
                r.report.with_extension("html").display()
            );
        }
        Err(e) => {
            // Interrupted: 4, as blis-loadgen's interrupted run.
            let code = if matches!(e, blis_loop::LoopError::Interrupted(_)) {
                4
            } else {
                1
            };
            blis_traces::diag!("error: {:#}", anyhow::Error::from(e));
            std::process::exit(code);
        }
    }
}
