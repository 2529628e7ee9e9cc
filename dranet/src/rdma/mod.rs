//! rdma
