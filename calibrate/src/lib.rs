//! blis-calibrate (work in progress; see the project README).
