sdy.mesh @mesh_2 = <["x"=2]>

// Sequential Baseline: Explicitly written, no shardings.
func.func @sequential_gather(%arg0: tensor<4x2xf32>, %arg1: tensor<2xi64>) -> tensor<2x2xf32> {
  %0 = "stablehlo.gather"(%arg0, %arg1) {
    dimension_numbers = #stablehlo.gather<
      offset_dims = [1], collapsed_slice_dims = [0],
      start_index_map = [0], index_vector_dim = 1>,
    slice_sizes = array<i64: 1, 2>
  } : (tensor<4x2xf32>, tensor<2xi64>) -> tensor<2x2xf32>
  return %0 : tensor<2x2xf32>
}

// Parallel in global view, to be converted to a device function.
//
// ([i, j], [k]) -> ([k, j]) reduction={i}
// The sharded dim is a reduction dimensions and it is also a collapsed dim.
func.func @parallel_gather(
  %arg0: tensor<4x2xf32> {sdy.sharding = #sdy.sharding<@mesh_2, [{"x"}, {}]>},
  %arg1: tensor<2xi64>) -> tensor<2x2xf32> {
  %0 = "stablehlo.gather"(%arg0, %arg1) {
    dimension_numbers = #stablehlo.gather<
      offset_dims = [1], collapsed_slice_dims = [0],
      start_index_map = [0], index_vector_dim = 1>,
    slice_sizes = array<i64: 1, 2>
  } : (tensor<4x2xf32>, tensor<2xi64>) -> tensor<2x2xf32>

  %1 = sdy.all_reduce {"x"} %0 out_sharding=<@mesh_2, [{}, {}]> : tensor<2x2xf32>
  return %1 : tensor<2x2xf32>
}
