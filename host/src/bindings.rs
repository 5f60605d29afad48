//! Host bindings generated from the top-level `wit/` package, the single source
//! of the node contract.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "node",
    imports: { default: async | trappable },
    exports: { default: async },
});
