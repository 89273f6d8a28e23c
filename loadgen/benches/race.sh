#!/usr/bin/env bash
# The load-generator race: blis-loadgen against AIPerf, guidellm,
# inference-perf, oha and `vllm bench serve`, each sending the same planned
# load to its own blis-mockserver on loopback, judged by the mock's served
# log (race/race.py says what is measured and how).
#
#   loadgen/benches/race.sh [race.py options]     e.g. --reps 3 --rates 100,1000
#
# The peers are installed at pinned versions into a throwaway environment
# (RACE_ENV, default target/race-env; kept between runs so that a rerun
# skips the installs): one virtualenv per Python peer (inference-perf needs
# Python >= 3.12: pyenv's 3.12 is used), oha from crates.io with its lock
# file. A peer that fails to install is left out of the race with a line
# saying so. The tables go to stdout, every run to OUT/race.json (RACE_OUT,
# default target/race).
#
# Takes about an hour on a 2-core machine with every peer (the installs add
# about 10 minutes, vLLM's 9 GB most of it); nothing else should run on the
# machine meanwhile: the tools and the mock share its cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q  # the whole workspace: the same artifacts as every other build
env_dir=${RACE_ENV:-target/race-env}
out=${RACE_OUT:-target/race}
mkdir -p "$env_dir"
py311=${PYTHON311:-python3}
py312=${PYTHON312:-}
if [ -z "$py312" ]; then  # pyenv's shims exist for versions that are not active: try each
  for c in "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python python3.12 python3.13; do
    if "$c" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then py312=$c; break; fi
  done
fi

AIPERF=aiperf==0.13.0
GUIDELLM=guidellm==0.8.1
INFERENCE_PERF=inference-perf==0.7.0
VLLM=vllm==0.33.0
OHA=oha@1.16.0

tools=(blis-loadgen)
venv() {  # venv NAME PYTHON PACKAGE
  local name=$1 python=$2 pkg=$3
  if [ -f "$env_dir/$name/.installed-$pkg" ]; then tools+=("$4"); return; fi
  echo "installing $pkg ..." >&2
  rm -rf "${env_dir:?}/$name"
  if "$python" -m venv "$env_dir/$name" &&
     timeout 1800 "$env_dir/$name/bin/pip" install -q --disable-pip-version-check "$pkg" >"$env_dir/$name.log" 2>&1; then
    touch "$env_dir/$name/.installed-$pkg"
    tools+=("$4")
  else
    echo "left out: $pkg did not install (see $env_dir/$name.log)" >&2
  fi
}
venv aiperf "$py311" "$AIPERF" aiperf
venv guidellm "$py311" "$GUIDELLM" guidellm
if [ -n "$py312" ]; then
  venv iperf "$py312" "$INFERENCE_PERF" inference-perf
else
  echo "left out: inference-perf needs Python >= 3.12 (none found; set PYTHON312)" >&2
fi
if [ -x "$env_dir/oha/bin/oha" ] ||
   timeout 1800 cargo install -q --locked "$OHA" --root "$env_dir/oha" >"$env_dir/oha.log" 2>&1; then
  tools+=(oha)
else
  echo "left out: $OHA did not build (see $env_dir/oha.log)" >&2
fi
if [ -n "$py312" ]; then
  venv vllm "$py312" "$VLLM" vllm-bench
fi

# The peers count tokens with a Hugging Face tokenizer and these machines
# reach no model hub: every tool gets the same local one.
tok="$env_dir/tokenizer"
if [ ! -f "$tok/tokenizer.json" ]; then
  for v in aiperf guidellm iperf; do  # any peer's environment has `tokenizers` and `transformers`
    if [ -x "$env_dir/$v/bin/python" ]; then
      "$env_dir/$v/bin/python" loadgen/benches/race/make_tokenizer.py "$tok" && break
    fi
  done
fi

{
  echo "peers: $AIPERF $GUIDELLM $INFERENCE_PERF $OHA $VLLM; racing: ${tools[*]}; $(nproc) cores; $(date -u +%F)"
} >&2
IFS=,; tool_list="${tools[*]}"; unset IFS
python3 loadgen/benches/race/race.py --bin target/release --env "$env_dir" \
  --tokenizer "$tok" --out "$out" --tools "$tool_list" "$@"
