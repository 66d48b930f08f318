//! placeholder: the status page and metrics endpoint
