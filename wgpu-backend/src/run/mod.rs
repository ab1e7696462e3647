//! Running each kernel kind: the plan from core (or, for matmuls and index ops, the pieces a
//! binding limit asks for), the pipeline from the cache, the `params` words and the bindings,
//! then the dispatch.

mod describe;
mod index;
mod map;
mod matmul;
mod reduce;
