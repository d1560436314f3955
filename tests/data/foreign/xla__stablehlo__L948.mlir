// CHECK-LABEL: HloModule main, entry_computation_layout={(f32[10]{0})->f32[10]{0}}

// CHECK:       %[[$region_0_2:[^ ]+]]
// CHECK-NEXT:  %[[Arg_0_3:[^ ]+]] = f32[] parameter(0)
// CHECK-NEXT:  %[[Arg_1_4:[^ ]+]] = f32[] parameter(1)
// CHECK-NEXT:  ROOT %[[maximum_5:[^ ]+]] = f32[] maximum(%[[Arg_0_3]], %[[Arg_1_4]]), metadata=

// CHECK:       ENTRY %[[$main_7:[^ ]+]]
// CHECK-NEXT:  %[[Arg_0_1:[^ ]+]] = f32[10] parameter(0)
// CHECK-NEXT:  ROOT %[[all_reduce_6:[^ ]+]] = f32[10] all-reduce(%[[Arg_0_1]]), channel_id=5,
// CHECK-SAME{LITERAL}: replica_groups={{0,2,4},{1,3,5,6}},
// CHECK-SAME:  to_apply=%[[$region_0_2]], metadata=

module {
  func.func @main(%arg0: tensor<10xf32>) -> tensor<10xf32> {
  %0 = "stablehlo.all_reduce"(%arg0) <{channel_handle = #stablehlo.channel_handle<handle = 5, type = 2>, replica_groups = dense<[[0, 2, 4, -1], [1, 3, 5, 6]]> : tensor<2x4xi64>}> ({
  ^bb0(%arg1: tensor<f32>, %arg2: tensor<f32>):
  %1 = stablehlo.maximum %arg1, %arg2 : tensor<f32>
  stablehlo.return %1 : tensor<f32>
  }) : (tensor<10xf32>) -> tensor<10xf32>
  return %0 : tensor<10xf32>
  }
}
// CHECK-DIRECT: stablehlo.all_reduce
