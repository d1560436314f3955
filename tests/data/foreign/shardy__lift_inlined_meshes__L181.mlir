// CHECK-DAG: sdy.mesh @mesh = <["x"=4]>
// CHECK-DAG: sdy.mesh @mesh_0 = <["y"=8]>
// CHECK-DAG: sdy.mesh @mesh_1 = <["z"=4]>

sdy.mesh @mesh = <["x"=4]>

// CHECK-LABEL: func @single_call
func.func @single_call(%arg0: tensor<16x32xf32>, %arg1: tensor<16x32xf32>) -> tensor<16x32xf32> {
  // CHECK-NEXT: call @foo(%arg0, %arg1) {sdy.sharding = #sdy.sharding_per_value<[<@mesh_0, [{}, {"y"}]>]>}
  %0 = call @foo(%arg0, %arg1) {sdy.sharding = #sdy.sharding_per_value<[<mesh<["y"=8]>, [{}, {"y"}]>]>} : (tensor<16x32xf32>, tensor<16x32xf32>) -> tensor<16x32xf32>
  func.return %0: tensor<16x32xf32>
}
// CHECK-LABEL: func @all_reduce_inlined_mesh
func.func @all_reduce_inlined_mesh(%arg0: tensor<16x32xf32>) -> tensor<16x32xf32> {
  // CHECK-NEXT: %0 = "stablehlo.all_reduce"(%arg0)
  // CHECK-SAME:   replica_groups = #stablehlo.replica_group_mesh_axes<mesh = @mesh_1, axes = [#stablehlo.axis_ref<name = "z">]>
  %0 = "stablehlo.all_reduce"(%arg0) ({
    ^bb0(%arg1: tensor<f32>, %arg2: tensor<f32>):
      %1 = stablehlo.add %arg1, %arg2 : tensor<f32>
      stablehlo.return %1 : tensor<f32>
  }) {
    replica_groups = #stablehlo.replica_group_mesh_axes<mesh = #stablehlo.mesh<axes = [#stablehlo.mesh_axis<name = "z", size = 4>]>, axes = [#stablehlo.axis_ref<name = "z">]>
  } : (tensor<16x32xf32>) -> tensor<16x32xf32>
  return %0 : tensor<16x32xf32>
}

// CHECK-LABEL: func private @foo
// CHECK-SAME: %arg0: tensor<16x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}
// CHECK-SAME: %arg1: tensor<16x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{?}, {?}]>}
// CHECK-SAME: -> (tensor<16x32xf32> {sdy.sharding = #sdy.sharding<@mesh_0, [{}, {"y"}]>}
func.func private @foo(%arg0: tensor<16x32xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"x"}, {}]>}, %arg1: tensor<16x32xf32> {sdy.sharding = #sdy.sharding<mesh<["x"=4]>, [{?}, {?}]>}) -> (tensor<16x32xf32> {sdy.sharding = #sdy.sharding<mesh<["y"=8]>, [{}, {"y"}]>}) {
  %0 = stablehlo.add %arg0, %arg1 : tensor<16x32xf32>
  return %0 : tensor<16x32xf32>
}
