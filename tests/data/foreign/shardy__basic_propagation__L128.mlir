sdy.mesh @mesh_a_2_b_2_c_2 = <["a"=2, "b"=2, "c"=2]>

// CHECK-LABEL: func @propagation_barrier_backward_just_arg_sharding(
// CHECK-SAME:      %arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh_a_2_b_2_c_2, [{"a", ?}, {"c", ?}]>})
// CHECK-SAME:  -> tensor<8x8xf32> {
func.func @propagation_barrier_backward_just_arg_sharding(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh_a_2_b_2_c_2, [{"a", ?}, {"c", ?}]>}) -> tensor<8x8xf32> {
  // CHECK-NEXT: sdy.propagation_barrier %arg0 allowed_direction=BACKWARD : tensor<8x8xf32>
  %0 = sdy.propagation_barrier %arg0 allowed_direction=BACKWARD : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
