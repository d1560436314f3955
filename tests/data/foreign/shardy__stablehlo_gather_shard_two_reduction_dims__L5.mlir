sdy.mesh @mesh_2_2 = <["x"=2, "y"=2]>

func.func @sequential_gather(%arg0: tensor<4x2x2xf32>, %arg1: tensor<2x1x2xi64>) -> tensor<2x1xf32> {
  %0 = "stablehlo.gather"(%arg0, %arg1) {
    dimension_numbers = #stablehlo.gather<
      offset_dims = [],
      collapsed_slice_dims = [0, 2],
      operand_batching_dims = [1],
      start_indices_batching_dims = [0],
      start_index_map = [0, 2],
      index_vector_dim = 2>,
    slice_sizes = array<i64: 1, 1, 1>
  } : (tensor<4x2x2xf32>, tensor<2x1x2xi64>) -> tensor<2x1xf32>
  return %0 : tensor<2x1xf32>
}

// ([r1, b, r2], [b, i, v]) -> ([b, i]) reduction={r1, r2}
//
func.func @parallel_gather(
    %arg0: tensor<4x2x2xf32> {sdy.sharding = #sdy.sharding<@mesh_2_2, [{"x"}, {}, {"y"}]>},
    %arg1: tensor<2x1x2xi64>) -> tensor<2x1xf32> {
  %0 = "stablehlo.gather"(%arg0, %arg1) {
    dimension_numbers = #stablehlo.gather<
      offset_dims = [],
      collapsed_slice_dims = [0, 2],
      operand_batching_dims = [1],
      start_indices_batching_dims = [0],
      start_index_map = [0, 2],
      index_vector_dim = 2>,
    slice_sizes = array<i64: 1, 1, 1>
  } : (tensor<4x2x2xf32>, tensor<2x1x2xi64>) -> tensor<2x1xf32>

  // All-reduce across both sharded reduction axes.
  %1 = sdy.all_reduce {"x", "y"} %0 out_sharding=<@mesh_2_2, [{}, {}]> : tensor<2x1xf32>
  return %1 : tensor<2x1xf32>
}
