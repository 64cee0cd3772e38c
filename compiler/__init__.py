"""hcc.compiler — frontend checks, bounds, tree packing, lowering, cost model."""
