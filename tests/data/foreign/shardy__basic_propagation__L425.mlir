sdy.mesh @mesh_a_2_b_2 = <["a"=2, "b"=2]>

// CHECK-LABEL: func @reshape_split_dim_single_axis_fully_shards_major_factor
func.func @reshape_split_dim_single_axis_fully_shards_major_factor(
    %arg0: tensor<8xf32> {sdy.sharding = #sdy.sharding<@mesh_a_2_b_2, [{"b", "a"}]>}) -> tensor<2x4xf32> {
  // CHECK-NEXT: stablehlo.reshape %arg0 {sdy.sharding = #sdy.sharding_per_value<[<@mesh_a_2_b_2, [{"b", ?}, {"a", ?}]>]>}
  %0 = stablehlo.reshape %arg0 : (tensor<8xf32>) -> tensor<2x4xf32>
  return %0 : tensor<2x4xf32>
}
