//! Helpers shared by the test files that run a service's pipeline on the
//! broker-free test driver (the runtime's `test-utils` feature, a
//! dev-dependency only, so that no service binary carries the driver).
//! Each test file compiles this module on its own and uses part of it.
#![allow(dead_code)]

pub mod driver;
