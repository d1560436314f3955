// all_reduce implicit capture test
// CHECK: HloModule
// CHECK: [[REG0:%region.*]] ({{.*}} {
// CHECK: f32[] constant(0)
// CHECK: ROOT
// CHECK: ENTRY
// CHECK: ROOT {{.*}} all-reduce{{.*}} to_apply=[[REG0]]
func.func @main(%arg0: tensor<f32>) -> tensor<f32> {
  %c = mhlo.constant dense<0.0> : tensor<f32>
  %0 = "mhlo.all_reduce"(%arg0) ({
  ^bb0(%arg1: tensor<f32>, %arg2: tensor<f32>):
    %1 = mhlo.add %arg1, %c : tensor<f32>
    mhlo.return %1 : tensor<f32>
  }) {replica_groups = dense<[[0], [1]]> : tensor<2x1xi64>} : (tensor<f32>) -> tensor<f32>
  return %0 : tensor<f32>
}
