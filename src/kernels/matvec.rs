//! Tiled and row-major matvec drivers.
