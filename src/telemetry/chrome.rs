//! chrome (in progress)
