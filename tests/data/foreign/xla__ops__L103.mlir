func.func @all_reduce_invalid_reducer(%operand: tensor<10xf32>) -> tensor<10xf32> {
  // expected-error@+2 {{'mhlo.all_reduce' op failed to infer returned types}}
  // expected-error@+1 {{Reduction-region must take 2 parameters, but takes 3 parameter(s)}}
  %0 = "mhlo.all_reduce"(%operand) <{
    replica_groups = dense<[[0, 2, 4, -1], [1, 3, -1, -1]]> : tensor<2x4xi64>
  }> ({
  ^bb0(%arg0: tensor<f32>, %arg1: tensor<f32>, %arg2: tensor<f32>):
    %max = mhlo.maximum %arg0, %arg1 : tensor<f32>
    "mhlo.return"(%max) : (tensor<f32>) -> ()
  }) : (tensor<10xf32>) -> tensor<10xf32>
  func.return %0 : tensor<10xf32>
}
