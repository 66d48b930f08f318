//! Fakes of the providers shepherd speaks to: real HTTP servers answering
//! from in-memory state, faithful to each provider's document, with fault
//! injection. They are the test doubles of every test and the target of
//! the demo; they live apart from the domain library so that nothing in
//! production links them but the `shepherd fake-*` commands.

pub mod faults;
pub mod latitude;
pub mod metal;
