# Sourced by the workflow scripts: sets BLIS_BIN to a folder holding the
# BLIS binaries (blis-loadgen, blis-replay, blis-calibrate, blis-mockserver,
# blis-loop).
#
# With BLIS_BIN set (e.g. to ~/.cargo/bin after `cargo install`), nothing is
# built. Otherwise the whole workspace is built once with
# `cargo build --release`: every script and every README command builds the
# same package selection, so they share one set of compiled dependencies
# (selecting packages with `-p` unifies features differently and recompiles
# the shared crates).
if [ -z "${BLIS_BIN:-}" ]; then
    echo "building the BLIS binaries (cargo build --release: 5-10 minutes the first time on 2 cores, seconds after)" >&2
    cargo build --release >&2
    BLIS_BIN=target/release
fi
for b in blis-loadgen blis-replay blis-calibrate blis-mockserver blis-loop; do
    if [ ! -x "$BLIS_BIN/$b" ]; then
        echo "error: $BLIS_BIN/$b is missing (unset BLIS_BIN to build it)" >&2
        exit 1
    fi
done
