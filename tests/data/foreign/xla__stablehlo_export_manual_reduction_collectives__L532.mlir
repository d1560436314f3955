sdy.mesh @mesh_x_2_y_4_z_2 = <["x"=2, "y"=4, "z"=2]>

// CHECK-LABEL: func @all_reduce_max_three_axes
func.func @all_reduce_max_three_axes(%arg0: tensor<8x8xf32> {sdy.sharding = #sdy.sharding<@mesh_x_2_y_4_z_2, [{"x"}, {"z"}], unreduced=max{"y"}>}) -> tensor<8x8xf32> {
  // CHECK:            %[[ALL_REDUCE:.*]] = "stablehlo.all_reduce"(%arg1) <{
  // CHECK-SAME:              channel_handle = #stablehlo.channel_handle<handle = {{.*}}, type = 1>,
  // CHECK-SAME{LITERAL}:     replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]> : tensor<4x4xi64>,
  // CHECK-SAME:              use_global_device_ids}> ({
  // CHECK-NEXT:            ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
  // CHECK-NEXT:              %[[MAX:.*]] = stablehlo.maximum %arg2, %arg3 : tensor<f32>
  // CHECK-NEXT:              stablehlo.return %[[MAX]] : tensor<f32>
  %0 = sdy.all_reduce max {"y"} %arg0 out_sharding=<@mesh_x_2_y_4_z_2, [{"x"}, {"z"}]> : tensor<8x8xf32>
  return %0 : tensor<8x8xf32>
}
