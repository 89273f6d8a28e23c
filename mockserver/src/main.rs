use std::io::Write;

use clap::Parser;

fn main() {
    let opts = blis_mockserver::Opts::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            blis_traces::diag!("error: starting the runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = rt.block_on(async {
        match blis_mockserver::start(&opts.config()).await {
            Ok(server) => {
                let mut out = blis_traces::stdio::PipeSafe::new(std::io::stdout().lock());
                let _ = writeln!(out, "listening on http://{}", server.addr);
                let _ = out.flush();
                drop(out);
                if server.addr.ip().is_loopback() {
                    blis_traces::diag!(
                        "loopback only: other machines cannot reach it (--host 0.0.0.0 to serve them)"
                    );
                }
                server.run_until_signal().await;
                0
            }
            Err(e) => {
                blis_traces::diag!("error: {e:#}");
                1
            }
        }
    });
    std::process::exit(code);
}
