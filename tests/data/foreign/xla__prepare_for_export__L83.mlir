// CHECK-LABEL: @all_reduce_with_implicit_capture
func.func @all_reduce_with_implicit_capture(%arg0: tensor<f32>) -> tensor<f32> {
    %c = mhlo.constant dense<0.0> : tensor<f32>
    // CHECK: mhlo.all_reduce
    // CHECK-NEXT: ^[[BB:bb.*]](%[[ARG1:arg.*]]: tensor<f32>, %[[ARG2:arg.*]]: tensor<f32>):
    %0 = "mhlo.all_reduce"(%arg0) ({
    ^bb0(%arg1: tensor<f32>, %arg2: tensor<f32>):
    // CHECK: %[[VAL1:.*]] = mhlo.constant dense<0.000000e+00> : tensor<f32>
    // CHECK: mhlo.add
    // CHECK-SAME: %[[ARG1]], %[[VAL1]]
      %1 = mhlo.add %arg1, %c : tensor<f32>
      mhlo.return %1 : tensor<f32>
    }) {replica_groups = dense<[[0], [1]]> : tensor<2x1xi64>} : (tensor<f32>) -> tensor<f32>
    return %0 : tensor<f32>
  }
