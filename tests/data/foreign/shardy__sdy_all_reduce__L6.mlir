sdy.mesh @mesh_2_2 = <["x"=2, "y"=2]>

// All-reduce across the entire mesh (both "x" and "y" axes).
func.func @all_reduce_xy(
  %arg0: tensor<4x4xi32> {sdy.sharding = #sdy.sharding<@mesh_2_2, [{}, {}]>})
  -> (tensor<4x4xi32> {sdy.sharding = #sdy.sharding<@mesh_2_2, [{}, {}]>}) {
  %0 = sdy.all_reduce {"x", "y"} %arg0 out_sharding=<@mesh_2_2, [{}, {}]> : tensor<4x4xi32>
  return %0 : tensor<4x4xi32>
}

// All-reduce across only the "x" axis.
// In a 2x2 mesh, this creates two replica groups: {0, 2} and {1, 3}.
func.func @all_reduce_x(
  %arg0: tensor<4x4xi32> {sdy.sharding = #sdy.sharding<@mesh_2_2, [{}, {}]>})
  -> (tensor<4x4xi32> {sdy.sharding = #sdy.sharding<@mesh_2_2, [{}, {}]>}) {
  %0 = sdy.all_reduce {"x"} %arg0 out_sharding=<@mesh_2_2, [{}, {}]> : tensor<4x4xi32>
  return %0 : tensor<4x4xi32>
}
