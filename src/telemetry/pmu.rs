//! pmu (in progress)
