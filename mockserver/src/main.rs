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
            eprintln!("error: starting the runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = rt.block_on(async {
        match blis_mockserver::start(&opts).await {
            Ok(server) => {
                println!("listening on http://{}", server.addr);
                let _ = std::io::stdout().flush();
                server.run_until_signal().await;
                0
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                1
            }
        }
    });
    std::process::exit(code);
}
