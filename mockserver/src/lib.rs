//! blis-mockserver (work in progress; see the project README).
