// CHECK-LABEL: HloModule main
// CHECK: ENTRY
// CHECK-NEXT:  %[[ARG:.*]] = f32[4,2] parameter(0)
// CHECK-NEXT:  %[[ARS:.*]] = f32[4,2] all-reduce-start(%[[ARG]]), channel_id=1,
// CHECK-SAME{LITERAL}: replica_groups={{0,1},{2,3}},
// CHECK-SAME:  to_apply=%{{.*}},
// CHECK-NEXT:  ROOT %{{.*}} = f32[4,2] all-reduce-done(%[[ARS]])
func.func @main(%arg0: tensor<4x2xf32>) -> tensor<4x2xf32> {
  %0 = "stablehlo.async_start"(%arg0) ({
  ^bb0(%arg1: tensor<4x2xf32>):
    %1 = "stablehlo.all_reduce"(%arg1) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>, replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>, use_global_device_ids}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %2 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %2 : tensor<f32>
    }) : (tensor<4x2xf32>) -> tensor<4x2xf32>
    stablehlo.return %1 : tensor<4x2xf32>
  }) : (tensor<4x2xf32>) -> !stablehlo.future<tensor<4x2xf32>>
  %3 = "stablehlo.async_done"(%0) : (!stablehlo.future<tensor<4x2xf32>>) -> tensor<4x2xf32>
  return %3 : tensor<4x2xf32>
}
// CHECK-DIRECT: stablehlo.async_start
// CHECK-DIRECT: stablehlo.all_reduce
// CHECK-DIRECT: stablehlo.async_done
