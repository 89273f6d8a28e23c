//! blis-replay (work in progress; see the project README).
