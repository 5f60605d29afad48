//! Host bindings generated from the top-level `wit/` package, the single source
//! of the node contract, and from the earlier versions it keeps (`wit/v0.1.0/`),
//! whose nodes run unchanged.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "node",
    imports: { default: async | trappable },
    exports: { default: async },
});

/// `wf:node@0.1.0`: its `capability` interface is served by the same
/// dispatch as the current one's ([`crate::capability`]).
pub mod v0_1_0 {
    wasmtime::component::bindgen!({
        path: "../wit/v0.1.0",
        world: "node",
        imports: { default: async | trappable },
        exports: { default: async },
    });
}
