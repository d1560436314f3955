func.func @all_reduce_invalid_reducer(%operand: tensor<10xf32>) -> tensor<10xf32> {
  // expected-error@+2 {{'mhlo.all_reduce' op failed to infer returned types}}
  // expected-error@+1 {{The element-type of reduction-region's result type at index 0 is expected to be promotable from the op's corresponding init-value element-type: 'tensor<i32>' vs 'tensor<f32>'}}
  %0 = "mhlo.all_reduce"(%operand) <{
    replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>
  }> ({
  ^bb0(%arg0: tensor<i32>, %arg1: tensor<i32>):
    %max = mhlo.maximum %arg0, %arg1 : tensor<i32>
    "mhlo.return"(%max) : (tensor<i32>) -> ()
  }) : (tensor<10xf32>) -> tensor<10xf32>
  func.return %0 : tensor<10xf32>
}
