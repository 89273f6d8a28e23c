//! Integration tests of `blis-calibrate`.

mod benchmark; // benchmark: leave-one-out and --fit-on over folders of vLLM runs
mod common; // replayed bundles of a two-client spec, running the CLI in-process
mod compare; // compare: identity, the JSON schema, saturation, errors
mod fit_cli; // fit: the table of fitted parameters with their units
mod physics; // trained-physics: the joint fit recovers known coefficients; failures are not inputs
mod saturation; // the saturation verdict on the main job and the vLLM ground truth
mod stats_fixtures; // KS and Wasserstein against values computed by scipy
